fn main() {
    let a = mlx_rs::Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]);
    let b = &a * &a;
    println!("{:?}", b.as_slice::<f32>());
}
