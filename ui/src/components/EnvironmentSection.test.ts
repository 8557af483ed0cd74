import { cleanup, render, screen } from '@testing-library/svelte';
import { afterEach, describe, expect, it } from 'vitest';
import { doctorReport } from '../../test/fixtures';
import EnvironmentSection from './EnvironmentSection.svelte';

afterEach(cleanup);

describe('EnvironmentSection', () => {
  it('shows versions, backend, device and memory', () => {
    render(EnvironmentSection, { report: doctorReport, error: null, open: true });
    const text = screen.getByTestId('environment').textContent ?? '';
    for (const shown of ['0.1.0 (release build)', '0.32.2', 'cpu (Intel Xeon, 2 cores)', '24.0 GiB total, 20.0 GiB available']) {
      expect(text).toContain(shown);
    }
  });

  it('on a Mac, names the kernels MLX loaded', () => {
    const onAMac = {
      ...doctorReport,
      backend: 'metal' as const,
      device: 'Apple M2 Pro',
      metal: {
        device_name: 'Apple M2 Pro',
        metallib: '/Applications/Ondo.app/Contents/Resources/mlx.metallib',
        metallib_macos: '14.0',
        libmlx: '/Applications/Ondo.app/Contents/Frameworks/libmlx.dylib',
        looked_in: ['/Applications/Ondo.app/Contents/Resources/mlx.metallib'],
      },
    };
    render(EnvironmentSection, { report: onAMac, error: null, open: true });
    const term = screen.getByText('Kernels');
    expect(term.nextElementSibling?.textContent).toBe('/Applications/Ondo.app/Contents/Resources/mlx.metallib');
  });

  it('names the ONDO_ variables set, with what each does', () => {
    const tuned = {
      ...doctorReport,
      variables: [
        { name: 'ONDO_CUDA_MATVEC', value: '0', purpose: "0 turns off Ondo's 4-bit matrix-vector kernel" },
      ],
    };
    render(EnvironmentSection, { report: tuned, error: null, open: true });
    const value = screen.getByText('ONDO_CUDA_MATVEC=0');
    expect(value.closest('dd')?.getAttribute('title')).toContain('turns off');
    expect(value.closest('dd')?.previousElementSibling?.textContent).toBe('Set');
  });

  it('with no variables set, has no such line', () => {
    render(EnvironmentSection, { report: doctorReport, error: null, open: true });
    expect(screen.queryByText('Set')).toBeNull();
  });

  it('off a Mac, has no kernels line', () => {
    render(EnvironmentSection, { report: doctorReport, error: null, open: true });
    expect(screen.getByTestId('environment').textContent).not.toContain('Kernels');
  });

  it('names a failed self-test with what to do', () => {
    const failed = {
      ...doctorReport,
      checks: [{ name: 'MLX version', passed: false, detail: 'install mlx[cpu]==0.32.2 and rebuild' }],
    };
    render(EnvironmentSection, { report: failed, error: null });
    const list = screen.getByRole('list', { name: 'MLX self-tests' });
    expect(list.textContent).toContain('Failed:');
    expect(list.textContent).toContain('install mlx[cpu]==0.32.2 and rebuild');
    expect(screen.getByText(/1 of 1 check failed/)).toBeTruthy();
  });

  it('says so when the report could not be collected', () => {
    render(EnvironmentSection, { report: null, error: { kind: 'internal', message: 'libmlx not found' } });
    expect(screen.getByRole('alert').textContent).toContain('libmlx not found');
  });
});
